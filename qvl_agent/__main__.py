from qvl_agent.cli import main

raise SystemExit(main())
