"""The pretraining corpus pipeline: documents read from text files, Hugging Face datasets or the bundled corpus,
cleaned as C4 and decontaminated, tokenized into token shards (cached by content), and read back as batches of
packed token windows or consecutive stream segments."""
