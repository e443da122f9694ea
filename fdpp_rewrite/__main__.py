from fdpp_rewrite.cli import main

raise SystemExit(main())
