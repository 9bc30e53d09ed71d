"""The wall: runs any Python script confined, whatever the script is.

`bubblewrap.run_sandboxed(source, ...)` runs a script under bubblewrap in new namespaces, with a read-only
root, sized tmpfs folders, a seccomp filter (`seccomp`), resource limits and a watchdog for what the kernel
does not count (`watchdog`), network only to the origins it is given through a forwarder (`net`), and its
files handed back through a pipe (`files_out`) to a new folder of the person's (`copy_back`).
`init_in_sandbox.py` is the first program inside; it is run as a file there, never imported here.

The sandbox knows nothing of what the script is for. It binds in this Python and its packages (so a
Playwright script finds Playwright) and the browser the caller names, and can lower Playwright's default
waits inside when asked; nothing more. It must never import the agent, the engine, the saved-script code
(`qvl_agent.scripts`), the browser helpers (`qvl_agent.playwright`), Playwright or Qt: everything else
imports it, and it imports only `qvl_agent.errors` (a contract in pyproject.toml).
"""
