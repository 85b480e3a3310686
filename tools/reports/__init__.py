"""The generators of the committed reports under ``reports/`` (never written by hand); not part of the package.

One command per engine, from the repository root (each needs its engine's virtualenv, see the
README): ``python -m tools.reports.example_reports`` (the example reports and their index),
``hf_reports`` (Hugging Face transformers), ``vllm_reports``, ``vllm_served`` (vLLM's server
audited over HTTP), ``openvino_reports``,
``eagle_reports``, ``lossy_reports`` (Medusa and HF's lossy sweeps); ``rerender`` renders every
committed report again from its recorded results.  ``common`` is their shared plumbing,
``templates/`` their README templates.
"""
