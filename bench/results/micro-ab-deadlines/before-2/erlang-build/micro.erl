%% The Distributed Erlang side of `maquis bench micro`: the same workloads as the Maquis agents.
%% A server node hosts partner processes p0..pN-1; in the closed loop each client process sends
%% a message with a payload to its partner and waits for the acknowledgement (or the payload
%% back, with Echo) before sending the next; see client/11 for the other modes.
-module(micro).
-export([server/2, client/11]).

%% Starts N partners; prints the process's CPU seconds for every line read on stdin and exits
%% when stdin closes. Hz is the kernel's clock tick rate (what /proc counts CPU time in).
server(N, Hz) ->
    [register(name(I), spawn(fun() -> partner(0) end)) || I <- lists:seq(0, N - 1)],
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

%% A partner answers calls and counts one-way data; asked, it says how many it has had (the
%% answer comes after every message the asker sent before asking: a pair's messages arrive in
%% order).
partner(Count) ->
    receive
        {From, Ref, Payload, true} -> From ! {Ref, Payload}, partner(Count);
        {From, Ref, _Payload, false} -> From ! {Ref, ok}, partner(Count);
        {data, _Payload} -> partner(Count + 1);
        {count, From, Ref} -> From ! {Ref, Count}, partner(Count)
    end.

name(I) -> list_to_atom("p" ++ integer_to_list(I)).

%% Runs one measurement and prints one JSON line. Mode: rtt (N closed-loop callers, at most K
%% measured calls each, Size-byte payloads), stream (N senders of one-way data; the partners'
%% counts say what was delivered) or mixed (the rtt measurement, then again while BulkN callers
%% of BulkSize bytes run beside it). Each measurement has WarmupMs of unmeasured traffic first
%% and lasts at most LimitMs. Hz as for server/2.
client(Server, Mode, N, Size, K, Echo, LimitMs, WarmupMs, Hz, BulkN, BulkSize) ->
    pong = net_adm:ping(Server),
    Payload = binary:copy(<<16#42>>, Size),
    Callers = lists:seq(0, N - 1),
    Json = case Mode of
        rtt ->
            {Lats, Secs, Cpu} = calls(Server, Callers, Payload, Echo, K, LimitMs, WarmupMs, Hz),
            result(Lats, Secs, Cpu, []);
        stream ->
            stream(Server, Callers, Payload, LimitMs, WarmupMs, Hz);
        mixed ->
            Cpu0 = cpu_s(Hz),
            {Alone, AloneSecs, _} = calls(Server, Callers, Payload, Echo, K, LimitMs, WarmupMs, Hz),
            {From, Deadline} = window(LimitMs, WarmupMs),
            BulkTag = spawn_callers(Server, lists:seq(N, N + BulkN - 1),
                                    binary:copy(<<16#42>>, BulkSize), Echo, 1 bsl 62, From, Deadline),
            Tag = spawn_callers(Server, Callers, Payload, Echo, K, From, Deadline),
            {Lats, End} = collect(Tag, N, From),
            {Bulk, BulkEnd} = collect(BulkTag, BulkN, From),
            result(Lats, secs(End, From), cpu_s(Hz) - Cpu0,
                   [{"alone", result(Alone, AloneSecs, 0.0, [])},
                    {"bulk", result(Bulk, secs(BulkEnd, From), 0.0, [])}])
    end,
    io:format("~s~n", [Json]),
    halt(0).

now_us() -> erlang:monotonic_time(microsecond).

%% The measured window that starts WarmupMs from now: {From, Deadline} in microseconds.
window(LimitMs, WarmupMs) ->
    From = now_us() + WarmupMs * 1000,
    {From, From + LimitMs * 1000}.

sleep_until(T) -> timer:sleep(max(0, (T - now_us()) div 1000)).

secs(End, From) -> max(End - From, 1) / 1.0e6.

%% One closed-loop measurement of the callers Is: {Latencies, Seconds, ClientCpuSeconds}.
calls(Server, Is, Payload, Echo, K, LimitMs, WarmupMs, Hz) ->
    {From, Deadline} = window(LimitMs, WarmupMs),
    Tag = spawn_callers(Server, Is, Payload, Echo, K, From, Deadline),
    sleep_until(From),
    Cpu0 = cpu_s(Hz),
    {Lats, End} = collect(Tag, length(Is), From),
    {Lats, secs(End, From), cpu_s(Hz) - Cpu0}.

%% Starts a caller per partner in Is; each sends its result tagged with the returned tag.
spawn_callers(Server, Is, Payload, Echo, K, From, Deadline) ->
    Self = self(),
    Tag = make_ref(),
    [spawn_link(fun() -> Self ! {Tag, loop({name(I), Server}, Payload, Echo, K, From, Deadline, [])} end)
     || I <- Is],
    Tag.

collect(Tag, Count, From) ->
    Results = [receive {Tag, R} -> R end || _ <- lists:seq(1, Count)],
    {lists:append([L || {L, _} <- Results]), lists:max([From | [E || {_, E} <- Results]])}.

loop(_Dst, _Payload, _Echo, 0, _From, _Deadline, Acc) -> {Acc, now_us()};
loop(Dst, Payload, Echo, K, From, Deadline, Acc) ->
    T = now_us(),
    case T >= Deadline of
        true -> {Acc, T};
        false ->
            Ref = make_ref(),
            Dst ! {self(), Ref, Payload, Echo},
            receive {Ref, _} -> ok end,
            case T >= From of
                true -> loop(Dst, Payload, Echo, K - 1, From, Deadline, [now_us() - T | Acc]);
                false -> loop(Dst, Payload, Echo, K, From, Deadline, Acc)
            end
    end.

%% One-way: each sender sends until the window ends; the partners' counts before and after
%% give what was delivered in the window.
stream(Server, Is, Payload, LimitMs, WarmupMs, Hz) ->
    {From, Deadline} = window(LimitMs, WarmupMs),
    Self = self(),
    Tag = make_ref(),
    [spawn_link(fun() -> Self ! {Tag, streamer({name(I), Server}, Payload, From, Deadline)} end)
     || I <- Is],
    sleep_until(From),
    Cpu0 = cpu_s(Hz),
    Rs = [receive {Tag, R} -> R end || _ <- Is],
    Cpu = cpu_s(Hz) - Cpu0,
    Sent = lists:sum([S || {S, _, _, _} <- Rs]),
    Got = lists:sum([G || {_, G, _, _} <- Rs]),
    T0 = lists:min([T || {_, _, T, _} <- Rs]),
    T1 = lists:max([T || {_, _, _, T} <- Rs]),
    Secs = secs(T1, T0),
    io_lib:format("{\"messages\":~b,\"errors\":~b,\"seconds\":~.6f,\"ops_per_s\":~.3f,"
                  "\"p50_us\":0,\"p99_us\":0,\"max_us\":0,\"cpu_s\":~.6f}",
                  [Got, max(Sent - Got, 0), Secs, Got / Secs, Cpu]).

streamer(Dst, Payload, From, Deadline) ->
    send_until(Dst, Payload, From, 0),
    Before = count(Dst),
    T0 = now_us(),
    Sent = send_until(Dst, Payload, Deadline, 0),
    After = count(Dst),
    {Sent, After - Before, T0, now_us()}.

send_until(Dst, Payload, Until, Sent) ->
    case now_us() >= Until of
        true -> Sent;
        false -> Dst ! {data, Payload}, send_until(Dst, Payload, Until, Sent + 1)
    end.

count(Dst) ->
    Ref = make_ref(),
    Dst ! {count, self(), Ref},
    receive {Ref, C} -> C end.

%% A RunResult as JSON, with Extra's {Key, Json} pairs after it.
result(Lats, Secs, Cpu, Extra) ->
    Sorted = lists:sort(Lats),
    Count = length(Sorted),
    [io_lib:format("{\"messages\":~b,\"errors\":0,\"seconds\":~.6f,\"ops_per_s\":~.3f,"
                   "\"p50_us\":~b,\"p99_us\":~b,\"max_us\":~b,\"cpu_s\":~.6f",
                   [Count, Secs, Count / Secs, pct(Sorted, Count, 50), pct(Sorted, Count, 99),
                    last(Sorted), Cpu]),
     [[",\"", K, "\":", V] || {K, V} <- Extra],
     "}"].

pct(_, 0, _) -> 0;
pct(Sorted, Count, P) ->
    Rank = round(P / 100 * (Count - 1)),
    lists:nth(Rank + 1, Sorted).

last([]) -> 0;
last(L) -> lists:last(L).
