"""The queue between generation and training: the producer that keeps the engines busy, the buffer
of finished groups, the filters, and the groups a checkpoint keeps."""
