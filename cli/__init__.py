"""The `kq` command line."""
