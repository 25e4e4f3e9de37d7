"""The inspector: a web page served by keymemd under ``/ui/`` to see and curate the store.

``routes`` holds its HTTP surface, ``auth`` the login links and sessions, ``data`` what each
page shows; ``static/`` the page itself (plain HTML, CSS and JavaScript) and, under
``static/vendor/``, cytoscape.js with its licence.
"""
