"""The datasets: arithmetic problems and text corpora generated or fetched, tokenized and batched."""
