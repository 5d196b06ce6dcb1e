"""`python -m dreamshard.cli`: the `dreamshard` command without its console script."""
import sys

from dreamshard.cli import main

sys.exit(main())
