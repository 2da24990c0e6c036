#!/bin/sh
# Does the GPU machine's nvidia-cuda-mps-control have multi-user mode (-M, what NVIDIA's DRA
# driver's MpsConfig.multiUser turns on: its PR #1153), and do clients of two uids then share one
# server? Run as root on a GPU host with torch (the device tool's machine): a private pipe and log
# directory, a client of uid 0 holding the GPU for 8 s, then one of uid 65534. Shared: the second
# reports while the first still holds the GPU, one server is listed, and the control log says
# "from user 0: Server already exists" for both. Without -M (MODE= to compare): the second waits
# until the first exits (issue 38's silent stall). Everything is quit and removed at the end.
set -u
MODE=${MODE--M}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-cuda-mps-control -h 2>&1 | grep -iE -- '-M|multi' || echo "(no multi-user option in -h)"
T=$(mktemp -d /tmp/mpsmu.XXXX); chmod 755 "$T"; mkdir -p -m 777 "$T/pipe" "$T/log"
export CUDA_MPS_PIPE_DIRECTORY=$T/pipe CUDA_MPS_LOG_DIRECTORY=$T/log
# shellcheck disable=SC2086  # MODE is one flag or none
nvidia-cuda-mps-control -d $MODE; echo "daemon -d $MODE rc=$?"; sleep 1
C='import os,time,torch;a=torch.randn(8192,8192,device="cuda");torch.cuda.synchronize();t=time.time();[a@a for _ in range(300)];torch.cuda.synchronize();print("uid",os.getuid(),"start",round(t%1000,2),"took",round(time.time()-t,2),flush=True);time.sleep(8)'
python3 -c "$C" & A=$!; sleep 3
setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp timeout 90 python3 -c "$C" & B=$!
sleep 4; echo get_server_list | nvidia-cuda-mps-control; ps -o user,pid,args -C nvidia-cuda-mps-server
wait $A; echo "A rc=$?"; wait $B; echo "B rc=$?"
grep -E 'NEW CLIENT|Server|user|rror' "$T/log/control.log" | head -20
echo quit | nvidia-cuda-mps-control; sleep 1; rm -rf "$T"
