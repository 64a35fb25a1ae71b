"""Sequential recommendation: predict a user's next item from their history (SASRec, Kang & McAuley 2018).

    data.py       loaders (RecBole atomic .inter, MovieLens ratings.dat / u.data / ratings.csv, user,item,timestamp CSV)
    fetch.py      MovieLens-100K from the RecBole 1.2.1 wheel on the package registry (read from the zip, no install)
    synthetic.py  a deterministic generator with long-range tastes and short-range habits
    split.py      stable time order, leave-one-out, truncation to the last ``max_len`` items
    metrics.py    HR@10 and NDCG@10: full ranking (seen items kept or excluded) and 100 sampled negatives
    models.py     sasrec (attnlab's backbone blocks), gru4rec, markov, pop
    train.py      one loop for the neural models: a loss at every position, early stopping on validation NDCG@10
    run.py        models x seeds x protocols -> one result dict (the CLI and claim 18 call it)
"""
