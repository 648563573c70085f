/* A shared object that is not a kiln model: it exports no kiln_model symbol.
 * test_libkiln checks that kiln_load refuses it with a clear message. */
int not_a_model_answer(void);
int not_a_model_answer(void) {
    return 42;
}
