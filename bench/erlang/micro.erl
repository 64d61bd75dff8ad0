%% The Distributed Erlang side of `maquis bench micro`: the same closed-loop workload as the
%% Maquis agents. A server node hosts partner processes p0..pN-1; each client process sends a
%% message with a payload to its partner and waits for the acknowledgement (or the payload
%% back, with Echo) before sending the next.
-module(micro).
-export([server/2, client/8]).

%% Starts N partners; prints the process's CPU seconds for every line read on stdin and exits
%% when stdin closes. Hz is the kernel's clock tick rate (what /proc counts CPU time in).
server(N, Hz) ->
    [register(name(I), spawn(fun partner/0)) || I <- lists:seq(0, N - 1)],
    io:format("ready~n"),
    serve_stdin(Hz).

serve_stdin(Hz) ->
    case io:get_line('') of
        eof -> halt(0);
        {error, _} -> halt(0);
        _ ->
            io:format("cpu ~.6f~n", [cpu_s(Hz)]),
            serve_stdin(Hz)
    end.

%% The CPU time, user and system, the whole OS process has used, in seconds. Not
%% `statistics(runtime)`: that counts user time only, and leaves out the kernel's share of the
%% work (system calls, the TCP stack, waking threads), which is most of a small message's cost;
%% the Maquis side is measured this way too.
cpu_s(Hz) ->
    {ok, Stat} = file:read_file("/proc/self/stat"),
    %% The fields after the command name (which may hold spaces) start after the last ')';
    %% utime and stime are the 12th and 13th of them.
    [_, Rest] = string:split(Stat, ")", trailing),
    Fields = string:lexemes(Rest, " "),
    Ticks = binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields)),
    Ticks / Hz.

partner() ->
    receive
        {From, Ref, Payload, true} -> From ! {Ref, Payload}, partner();
        {From, Ref, _Payload, false} -> From ! {Ref, ok}, partner()
    end.

name(I) -> list_to_atom("p" ++ integer_to_list(I)).

%% Runs N client processes, K measured messages each, Size-byte payloads, after WarmupMs of
%% unmeasured traffic and for at most LimitMs; prints one JSON line. Hz as for server/2.
client(Server, N, Size, K, Echo, LimitMs, WarmupMs, Hz) ->
    pong = net_adm:ping(Server),
    Payload = binary:copy(<<16#42>>, Size),
    Self = self(),
    Start = erlang:monotonic_time(microsecond),
    From = Start + WarmupMs * 1000,
    Deadline = From + LimitMs * 1000,
    [spawn_link(fun() -> Self ! {done, loop({name(I), Server}, Payload, Echo, K, From, Deadline, [])} end)
     || I <- lists:seq(0, N - 1)],
    timer:sleep(WarmupMs),
    Cpu0 = cpu_s(Hz),
    Results = [receive {done, R} -> R end || _ <- lists:seq(1, N)],
    Lats = lists:append([L || {L, _} <- Results]),
    T1 = lists:max([From | [E || {_, E} <- Results]]),
    Cpu1 = cpu_s(Hz),
    Secs = max(T1 - From, 1) / 1.0e6,
    Sorted = lists:sort(Lats),
    Count = length(Sorted),
    io:format("{\"messages\":~b,\"errors\":0,\"seconds\":~.6f,\"ops_per_s\":~.3f,"
              "\"p50_us\":~b,\"p99_us\":~b,\"max_us\":~b,\"cpu_s\":~.6f}~n",
              [Count, Secs, Count / Secs, pct(Sorted, Count, 50), pct(Sorted, Count, 99),
               last(Sorted), Cpu1 - Cpu0]),
    halt(0).

loop(_Dst, _Payload, _Echo, 0, _From, _Deadline, Acc) -> {Acc, erlang:monotonic_time(microsecond)};
loop(Dst, Payload, Echo, K, From, Deadline, Acc) ->
    T = erlang:monotonic_time(microsecond),
    case T >= Deadline of
        true -> {Acc, T};
        false ->
            Ref = make_ref(),
            Dst ! {self(), Ref, Payload, Echo},
            receive {Ref, _} -> ok end,
            case T >= From of
                true -> loop(Dst, Payload, Echo, K - 1, From, Deadline, [erlang:monotonic_time(microsecond) - T | Acc]);
                false -> loop(Dst, Payload, Echo, K, From, Deadline, Acc)
            end
    end.

pct(_, 0, _) -> 0;
pct(Sorted, Count, P) ->
    Rank = round(P / 100 * (Count - 1)),
    lists:nth(Rank + 1, Sorted).

last([]) -> 0;
last(L) -> lists:last(L).
