"""``python -m objq_broker``: the demo run."""

from objq_broker.demo import main

main()
