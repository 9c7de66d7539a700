"""PipeDream Table 1: the paper's rows (:mod:`.rows`), its settings and alternatives (:mod:`.paper`), and
the real-process check at reduced scale (:mod:`.measure`)."""
