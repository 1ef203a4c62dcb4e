"""`draftwise bench`: workloads, methods and peers, the run protocol, metrics, report, plots, compare.

The library never imports this package; it imports the library.  Entry point:
`draftwise.bench.main.run_bench` (the command line, `draftwise.cli.bench`, calls it).
"""
