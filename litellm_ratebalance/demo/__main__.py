from litellm_ratebalance.demo.run import main

raise SystemExit(main())
