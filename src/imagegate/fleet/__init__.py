"""A GPU fleet as one piece: which nodes to check and their Jobs (read), the Jobs run at most N
at a time or collected (jobs), each node's check judged beside its peers (judge), and the node's
own signed statement (node_statement). The CLI's `fleet` commands parse their options, call these
and print."""
