"""Everything about Playwright scripts: the browser flags (`flags`), locator resolution for a point on a
page (`locate`), compiling a browser run into a standalone script (`export`), the static policy that
model-written scripts must pass (`policy`), and writing and verifying such scripts (`scripts`).

Importing this package imports no Playwright: the modules that drive a browser import it lazily.
"""
