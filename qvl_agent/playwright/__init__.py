"""Everything about Playwright scripts: the browser flags (`flags`), locator resolution for a point on a
page (`locate`), compiling a browser run into a standalone script (`export`) with its first lines
(`header`) and each step's intent (`intent`), its literals, secret reads included, through one builder
(`literals`, checked by `export_gate`), the lint that gives the model advice on the scripts it writes
(`policy`, its tables in `policy_rules`; not a security boundary), writing and verifying such scripts
(`scripts`), the bubblewrap sandbox that every run of a saved script goes through (`sandbox`, with
`sandbox_init` as its first program inside, `sandbox_watch`, `sandbox_seccomp` and `sandbox_files` beside
it), running a saved script in it (`replay`), keeping the files a script wrote (`copy_back`), and healing
a replay whose page changed (`heal_replay`: `heal_hook` inside the sandbox, `heal` outside, the healed
script written by `heal_rewrite`).

Importing this package imports no Playwright: the modules that drive a browser import it lazily.
"""
