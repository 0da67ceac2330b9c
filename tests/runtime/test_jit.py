

def test_llvm_missed_vectorization_warnings_are_not_printed(capfd):
    # A short loop the kernel asks LLVM to vectorize, which LLVM cannot: its warning went to
    # the user's stderr. Anything else written to the descriptor meanwhile still comes out.
    import os

    from fusegrad.runtime.jit import _quiet_missed_vectorization
    with _quiet_missed_vectorization():
        os.write(2, b"warning: <unknown>:0:0: loop not vectorized: the optimizer was unable "
                    b"to perform the requested transformation; the transformation might be "
                    b"disabled\n")
        os.write(2, b"something else\n")
    err = capfd.readouterr().err
    assert "loop not vectorized" not in err and "something else" in err
