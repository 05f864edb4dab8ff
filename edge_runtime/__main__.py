from edge_runtime.cli import main

raise SystemExit(main())
