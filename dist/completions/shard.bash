# bash completion for shard: the flags of `shard --help` and the values of -s.
# Install: cp dist/completions/shard.bash /usr/share/bash-completion/completions/shard
_shard() {
    local cur prev
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    case "$prev" in
        -s)
            COMPREPLY=($(compgen -W "stop quit reopen reload" -- "$cur"))
            return
            ;;
        -c|-e)
            COMPREPLY=($(compgen -f -- "$cur"))
            return
            ;;
        -p)
            COMPREPLY=($(compgen -d -- "$cur"))
            return
            ;;
        -g)
            COMPREPLY=($(compgen -W "'daemon off;' 'master_process off;'" -- "$cur"))
            return
            ;;
    esac
    COMPREPLY=($(compgen -W "-? -h --help -v -V -t -T -q -s -p -c -e -g" -- "$cur"))
}
complete -F _shard shard
