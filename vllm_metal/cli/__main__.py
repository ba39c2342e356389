import sys

from vllm_metal.cli import main

sys.exit(main())
