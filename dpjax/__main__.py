import sys

from dpjax.cli.main import main

sys.exit(main())
