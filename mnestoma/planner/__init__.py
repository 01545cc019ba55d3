"""The planner's reads: ``rank`` and ``suggest_next``'s order, ``predict_next``'s
probabilities, the sieve's ``vet`` and the picture of the graph."""
