"""Write: the model writes a Playwright script for a task, and the script is verified in the sandbox.

`writer` asks the model, runs each attempt in `qvl_agent.sandbox` and feeds failures back; `policy` (its
tables in `policy_rules`) is a lint whose findings are advice for the model, never a security boundary.
Never imports Qt or the agent loop.
"""
