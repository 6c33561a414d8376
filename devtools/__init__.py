"""What tests/ and scripts/ share (neither imports the other): process helpers read from
/proc, the hostile request bodies of the adversarial test and the HTTP soak, and the hard
timeout of tensor-parallel runs. Not part of the installed package."""
