"""The ``dpjax`` command-line tool.  See :mod:`dpjax.cli.main`."""
