"""Heal: `replay --heal` repairs a saved script whose page changed.

`replay` runs the script in the sandbox with `hook_in_sandbox.py` loaded first (it runs inside the
sandbox, with only the standard library, Playwright and `qvl_agent/playwright/locate.py`; qvl-agent never
imports it). The hook asks `service`, outside, over a unix socket; the service asks the model where the
element is now. `rewrite` writes `NAME.healed.py` as syntax from the service's records. Never imports Qt
or the agent loop.
"""
