"""`draftwise bench`: workloads, methods and peers, the run protocol, metrics, report, plots, compare.

The library never imports this package; it imports the library.  Entry points:
`draftwise.bench.cli.bench_app` (typer sub-app) and `draftwise.bench.main.run_bench`.
"""
