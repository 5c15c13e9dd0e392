#include <cstdio>
int main() { std::puts("tandem"); return 0; }
