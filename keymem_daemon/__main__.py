"""``python -m keymem_daemon``: the ``keymemd`` command line."""

from __future__ import annotations

from keymem_daemon.cli import main

if __name__ == "__main__":
    main()
