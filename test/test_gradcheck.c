/* test_gradcheck: placeholder until its author lands it */
int main(void) { return 77; }
