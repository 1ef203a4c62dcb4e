"""`draftwise serve`: an OpenAI-compatible HTTP server on the multi-request engine.

One module per role: `config` (the server's limits), `schema` (request bodies to frozen
requests, every refusal by name), `errors` (OpenAI-style error bodies), `stops` (stop strings
left out of the answer, streamed or not), `engine_worker` (the one thread that owns the
`Engine`: admission, rounds, cancels, timeouts, the shutdown grace), `responses` (OpenAI
response and chunk shapes), `metrics` (a Prometheus registry of its own), `app` (the FastAPI
routes and Server-Sent Events) and `server` (uvicorn, and SIGTERM as a drain).  FastAPI,
uvicorn and prometheus-client are the `serve` extra: only these modules import them, so the
core imports without it.
"""
