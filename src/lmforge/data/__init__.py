"""Data, by job, each a package:

- ``corpus``: the pretraining corpus pipeline: reading text files (``readers``), C4 cleaning (``clean``),
  decontamination against labelled sets, tokenizing into token shards (``prepare``, ``prepared_cache``), the bundled
  default corpus (``bundled``) and the batches of packed token windows (``loader``, ``stream``);
- ``labelled``: labelled sets: the ``Example``/``Dataset`` types, the readers of labelled files and of the bundled
  and fetched set directories (``readers``), GLUE/SuperGLUE, Winograd, Story Cloze, BLiMP, parallel text;
- ``fetch``: recipes that build corpora and labelled sets from public registry packages into the local cache.

Imports go one way: ``corpus`` → ``fetch`` → ``labelled`` (the corpus pipeline reads fetched corpora and
decontaminates against labelled sets; the fetch recipes write labelled sets). What more than one job uses sits
here, beside this file, and imports none of the three: ``hf_datasets`` (Hugging Face datasets as inputs),
``surrogates``, ``tables`` (strict CSV/TSV records) and ``ngrams`` (word n-grams for overlap checks).
"""
