"""The ``txsync`` command line."""
