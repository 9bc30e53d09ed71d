"""Browser helpers shared by the browser executor and saved scripts: which Chromium to launch
(`chromium`) and its flags (`flags`), and how a point on a live page becomes an element and a locator
(`locate`, standard library only: it also runs inside the sandbox for healing).

Saved scripts live in `qvl_agent.scripts`, the wall they run in in `qvl_agent.sandbox`. Importing this
package imports no Playwright: the modules that drive a browser import it lazily.
"""
