"""``python -m keymem_shim``: the same as the ``keymem-shim`` console script."""

from keymem_shim import main

main()
