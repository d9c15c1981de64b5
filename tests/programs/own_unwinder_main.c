/* Calls the library of own_unwinder_lib.cpp, which throws through its own unwinder. */
#include <stdio.h>

int lib_run(int n);
void lib_counts(void);

int main(void)
{
    printf("sum %d\n", lib_run(30));
    lib_counts();
    return 0;
}
