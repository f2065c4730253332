"""The datasets: arithmetic problems generated and text corpora fetched, then tokenized into the
memory-mapped token files that training and evaluation read."""
