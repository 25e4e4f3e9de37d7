"""The MCP surface: ``tools.py`` (the TOOLS table and how a call's arguments are read) and
``instructions.py`` (the server instructions and prompt). The shim imports only
``instructions`` (no engine), so this package's ``__init__`` imports nothing."""
