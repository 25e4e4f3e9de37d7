"""The daemon's HTTP edge: ``app.create_app`` builds it (see its docstring for the layout)."""
