"""Labelled sets: the `Example`/`Dataset` types that task types and evaluation consume, and the readers of labelled
files (tables, SQuAD, CoNLL, SST, SNLI, GLUE/SuperGLUE, Winograd, Story Cloze, BLiMP, parallel text) and of the
bundled and fetched labelled-set directories."""
