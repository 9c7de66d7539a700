"""The simulator against the runtime: the replay of measured actions (:mod:`.accuracy`) and the cost-model
terms behind each error (:mod:`.terms`)."""
