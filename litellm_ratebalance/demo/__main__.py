"""``python -m litellm_ratebalance.demo`` (what ``make demo`` runs): see ``run.py`` for what it does and its flags."""

from litellm_ratebalance.demo.run import main

raise SystemExit(main())
