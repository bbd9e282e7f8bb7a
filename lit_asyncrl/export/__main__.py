"""`python -m lit_asyncrl.export CKPT --out DIR`: see `lit_asyncrl.export.main`."""

from lit_asyncrl.export.main import main

raise SystemExit(main())
