"""Model -> observations: the policy loaded and linted, its batch axes and contract, the observation set every cell sees."""
