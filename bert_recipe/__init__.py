"""The BERT recipe's library: the entry scripts at the top of the checkout are its face."""
