"""Everything about Playwright scripts: the browser flags (`flags`), locator resolution for a point on a
page (`locate`), compiling a browser run into a standalone script (`export`), the static policy that
model-written scripts must pass (`policy`, its tables in `policy_rules`), writing and verifying such
scripts (`scripts`), the bubblewrap sandbox they are verified in (`sandbox`, with `sandbox_init` as its
first program inside) and the literals of exported scripts, secret reads included (`literals`,
checked by `export_gate`).

Importing this package imports no Playwright: the modules that drive a browser import it lazily.
"""
