"""The backpressure part's pure policy for local inference servers, with no LiteLLM and no I/O of its own
beyond the metrics scrape: settings (:mod:`.config`), the adaptive concurrency limit (:mod:`.limits`), the
fair wait queue (:mod:`.queue`), priority shedding (:mod:`.shedding`), the learned output a request reserves
(:mod:`.output`), what each inference server's ``/metrics`` says (:mod:`.servers`) and server / GPU signals
(:mod:`.signals`).

The LiteLLM callback built on them is ``litellm_ratebalance.backpressure`` (an instance of
:class:`litellm_ratebalance.proxy.backpressure.BackpressureCallback`); this package has another name so
that the two never clash.
"""
