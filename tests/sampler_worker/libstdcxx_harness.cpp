// The C++ standard library pieces llama.cpp's samplers use, driven from the tests: std::mt19937 with
// std::uniform_real_distribution<double>, std::sort and std::partial_sort on float keys.
// Built with the system C++ compiler at test time, so it uses the same libstdc++ headers as the
// llama.cpp the tests compare against. Reads commands on stdin, one per line group:
//   words SEED COUNT            -> COUNT outputs of std::mt19937(SEED), decimal
//   uniform SEED COUNT          -> COUNT draws of uniform_real_distribution<double>(0.0f, 1.0f), %a
//   sort N KEY...               -> positions after std::sort(first, last, key <)
//   partial N M KEY...          -> first M positions after std::partial_sort(first, first + M, last, key <)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

struct item { float key; int position; };

int main() {
    char command[16];
    while (std::scanf("%15s", command) == 1) {
        if (std::strcmp(command, "words") == 0 || std::strcmp(command, "uniform") == 0) {
            unsigned long seed = 0;
            int count = 0;
            std::scanf("%lu %d", &seed, &count);
            std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
            std::uniform_real_distribution<double> dist(0.0f, 1.0f);
            for (int i = 0; i < count; ++i) {
                if (command[0] == 'w') {
                    std::printf("%lu ", static_cast<unsigned long>(rng()));
                } else {
                    std::printf("%a ", dist(rng));
                }
            }
        } else {
            const bool partial = std::strcmp(command, "partial") == 0;
            int n = 0;
            int m = 0;
            std::scanf("%d", &n);
            if (partial) {
                std::scanf("%d", &m);
            } else {
                m = n;
            }
            std::vector<item> items(n);
            for (int i = 0; i < n; ++i) {
                std::scanf("%f", &items[i].key);
                items[i].position = i;
            }
            const auto less = [](const item & a, const item & b) { return a.key < b.key; };
            if (partial) {
                std::partial_sort(items.begin(), items.begin() + m, items.end(), less);
            } else {
                std::sort(items.begin(), items.end(), less);
            }
            for (int i = 0; i < m; ++i) {
                std::printf("%d ", items[i].position);
            }
        }
        std::printf("\n");
        std::fflush(stdout);
    }
    return 0;
}
