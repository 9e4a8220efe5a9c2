# Which runs one shard of a test VM takes (init.sh; xtask/src/vm/shard.rs).
# Reads the weights (LABEL SECONDS a line, `*` for a run not listed), then
# the runs (LABEL first on each line, in init.sh's order), and prints the
# labels of shard `shard` (K/N, K from 1). Longest run first, each to the
# shard with the least work so far (the first such on a tie): every shard's
# boot computes the same split, so together they run each run once, and the
# expensive runs land on different shards.
FNR == NR { weight[$1] = $2; next }
{ n++; label[n] = $1; cost[n] = ($1 in weight) ? weight[$1] : weight["*"] }
END {
    split(shard, s, "/")
    k = s[1] + 0
    of = s[2] + 0
    if (k < 1 || of < 1 || k > of) {
        print "bad shard " shard " (want K/N, 1 <= K <= N)" > "/dev/stderr"
        exit 1
    }
    for (j = 1; j <= of; j++) load[j] = 0
    for (m = 1; m <= n; m++) {
        # The heaviest run not yet placed (the first listed on a tie).
        best = 0
        for (i = 1; i <= n; i++)
            if (!(i in placed) && (best == 0 || cost[i] > cost[best])) best = i
        to = 1
        for (j = 2; j <= of; j++)
            if (load[j] < load[to]) to = j
        placed[best] = to
        load[to] += cost[best]
    }
    for (i = 1; i <= n; i++)
        if (placed[i] == k) print label[i]
}
