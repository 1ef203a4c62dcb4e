"""`draftwise bench serve`: OpenAI-compatible servers under load, side by side.

    sse.py       Server-Sent Events: bytes in, each event's data out; OpenAI stream chunks read
    loadgen.py   the client: one streamed request timed chunk by chunk; closed and open loops
    metrics.py   request throughput, output tok/s, TTFT, TPOT, ITL, E2EL (vLLM's conventions)
    servers.py   start a server as a subprocess on 127.0.0.1, wait until it answers, always stop it
    settings.py  the run's typed settings, parsed from the command line's strings once
    run.py       the session: servers one at a time, cells resumable, results.json
    summary.py   one row per (server, load): medians over repeats, exactness against the plain server
    report.py    summary.json and report.md; plots.py the PNGs

The servers are always separate processes spoken to over HTTP: this package imports neither
`draftwise.serve` nor `draftwise.cli` (a tool sits above the library, and measures a server as
its users reach it)."""
