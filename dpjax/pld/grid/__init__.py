"""The PLD grid pipeline: discretize, compose by FFT, convert, plan, the program and its engine."""
