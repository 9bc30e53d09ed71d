"""Export: a browser run's trace compiled into a standalone Playwright script.

`exporter` turns the run's steps into code through `steps` (locators, fill/check/select), ends it with
`assertions` on the end state, and `gate` refuses to write a script holding code the exporter never
writes. Every value goes through `qvl_agent.scripts.literals`. Never imports torch, Playwright, Qt or the
engine: exporting needs no model and no browser.
"""
