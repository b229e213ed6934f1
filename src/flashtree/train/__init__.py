"""Training recipes: corpus + tokenizer, the bundled target LM, and DFlash drafters."""
