"""Runnable examples that need nothing downloaded (`python -m lit_asyncrl.examples.<name> --help`)."""
